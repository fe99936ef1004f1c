from evolver.launch import main

raise SystemExit(main())
