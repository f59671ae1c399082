"""From incidents to notifications: message building (pure) and the sinks that deliver them."""
