"""From paired samples to a verdict: intervals, multiplicity, calibration and stopping rules.

- `stats`: repeats as paired blocks, an interval honest at 2-5 blocks, the MDE and the verdict;
- `holm`: one family of verdicts per run (D-VERDICT-1);
- `resolution`: whether a metric whose values fall on a few fixed steps can resolve the effect at all;
- `calibration`: A/A spreads of one machine, refused under other conditions (D-VERDICT-2);
- `until_resolved`: add repeats until the interval resolves or the budget is spent.
"""
