"""One module per `tts-bench` subcommand. Each command body: parse -> call library -> write
record -> render -> return an ExitStatus.

The one place where the harness imports itself inside functions: each command imports its
library (and with it pandas, numpy, scipy, torch, piper, whisper) in its body, so `tts-bench
--help` and typer's parsing load only typer and the config schema. Everywhere else in
`tts_bench` imports sit at the top of the module (tests/unit/test_layering.py), unless a
`# lazy:` comment says what the wait saves."""
