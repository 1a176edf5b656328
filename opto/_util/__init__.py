"""Private helpers every layer may use: async bridging, crash-safe files, the installed
distribution, and API-key redaction. Nothing here is public API."""
