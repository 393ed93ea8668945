from eclectus.cli import main

raise SystemExit(main())
