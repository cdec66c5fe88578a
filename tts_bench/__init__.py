"""tts-bench: TTS serving benchmarks and accuracy gates (the harness).

`tts_bench.cli` is the one entry point; library modules never configure logging or exit.
"""

__version__ = "0.1.0"
