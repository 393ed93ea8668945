"""``python -m eclectus.server``: the same as ``eclectus serve``."""

from eclectus.server.main import main

raise SystemExit(main())
