"""The command line (cli) and its jobs: settings, training, evaluation, sweep, report, bench, plot."""
