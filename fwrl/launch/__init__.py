"""Command line, configs, presets, run directories, progress and benchmarks."""
