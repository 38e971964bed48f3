"""The streamnb daemon: workers that learn and predict from Redis streams."""
