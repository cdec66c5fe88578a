"""One module per `tts-bench` subcommand. Each command body: parse -> call library -> write
record -> render -> return an ExitStatus. Heavy imports (torch, piper, whisper) stay inside the
function bodies so `tts-bench --help` is instant."""
