"""Model transports, one file per wire protocol."""
