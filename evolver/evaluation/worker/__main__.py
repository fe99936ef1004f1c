"""python -m evolver.evaluation.worker OUT_DIR/request.json: one worker, outside the zygote (which forks
workers and calls main itself)."""

from evolver.evaluation.worker import main

raise SystemExit(main())
