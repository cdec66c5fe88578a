"""Reference decoders the project's code2wav is measured against (test and measurement side only:
`stages` never imports this package).

* `official`: the official MiniCPM-o 4.5 token2wav modules (PyPI `minicpmo-utils==1.0.7`,
  installed with `pip install --no-deps`), built at any `Code2WavConfig` dims.
* `fidelity`: deviation figures (max |delta|, SNR, log-spectral distance) and the runs that feed
  them the same tokens, voice and noise.
"""
