"""Training steps: a step is a request (docs/design.md, "Training steps").

:mod:`.steps` attributes each rank's ``train_step`` traces (exposed communication, peer
wait, stragglers, clock alignment); :mod:`.diff` compares two runs (scaling efficiency
and the bottleneck); :mod:`.gate` checks a run against budgets on samples/s or step
time. Results are the plain dataclasses of :mod:`.model`.
"""
