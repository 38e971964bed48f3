"""Mail systems' own filter protocols in front of the workers: spamd's (``spamc``) and
Rspamd's HTTP protocol (``rspamc``), both over the milter's verdict path."""
