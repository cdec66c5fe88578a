"""The system under test: the MiniCPM-o 4.5 talker and code2wav, their kernels, caches and runner.

Nothing in this package imports `tts_bench`, typer or rich; only `stages.platform` knows which
kind of device it runs on. Model code takes a device and a dtype.
"""
