from extproc.cli import main
raise SystemExit(main())
