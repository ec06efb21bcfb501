"""Settings: the config models, the command-line flags built from them, presets and the core catalogue."""
