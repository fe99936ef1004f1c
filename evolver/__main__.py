from evolver.cli.launch import main

raise SystemExit(main())
