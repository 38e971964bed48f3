"""What the tests share: servers they start, workers, clients, fixtures."""
