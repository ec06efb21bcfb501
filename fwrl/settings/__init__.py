"""Settings: the config models of every command, presets, family defaults and the core catalogue (the
command-line flags built from them are ``fwrl.launch.flags``)."""
