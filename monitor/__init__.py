"""Monitor: capture memcached requests and find the hot keys with bounded memory."""
