"""The CI perf gate: case files, baselines with provenance, and a significance-aware verdict.

    tts-bench gate --run-case configs/cases/tiny-embedded.yaml --profile cpu-2core
    tts-bench gate --baseline results/baselines/synthetic.cpu-2core.json --current results/runs/<run>
    tts-bench baseline update --case configs/cases/synthetic.yaml --from <run> <run> <run>
    tts-bench calibrate synthetic --runs 200

Modules: `case` (case YAML), `bench` (run a case), `samples` (read a run: samples + provenance),
`baseline` (build / write baselines), `judge` (marks and exit code; the U test is scipy's, through
`tts_bench.verdicts.stats.mann_whitney_p`),
`calibrate` (A/A runs of a case: false-verdict rate and run-to-run variance, read back through
`tts_bench.verdicts.calibration`).
"""
