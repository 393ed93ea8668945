"""``eclectus eval load``: many programs at once, arriving open-loop, on each system.

- :mod:`.mix`: the program types, their sizes, the mix, and the seeded arrival schedule;
- :mod:`.programs`: one program instance, run as an ordinary LangChain/LangGraph app;
- :mod:`.driver`: a run: the schedule's instances started at their arrival times, drained;
- :mod:`.stats`: per type latency percentiles, goodput within the SLO, the highest rate
  meeting it;
- :mod:`.systems`: the servers compared (stock vLLM, Eclectus, both together, the pool);
- :mod:`.report`, :mod:`.plots`: report.md, results.json and the plots;
- :mod:`.cli`: the command.

See docs/evals.md, "Many programs at once".
"""
