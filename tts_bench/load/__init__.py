"""Offering load and measuring it: the request schedule, phases and per-request metrics.

- `phases`: the one phase driver every command that runs load uses (hooks protocol);
- `loadgen`: the closed- and open-loop sender (`send_on_schedule`) and the count phase;
- `loadwindow` and `windows`: duration mode (ramp, window, drain; sub-window stability);
- `arrivals`: open-loop inter-arrival times (Poisson / gamma, seeded);
- `metrics`: `audio_rtf`, `audio_ttfp_ms`, throughput and their aggregates;
- `stage_work`: the stages' own step counters, as a table beside the client's figures.
"""
