from evolver.cli import main

raise SystemExit(main())
