"""The assembly layer: the command line (cli), the startup checks (preflight), logging (logs),
the banner, the model runner's setup (runner_setup) and what builds the engine and the app from
a Config and serves them (assembly). `prelude/__main__.py` is its entry point."""
