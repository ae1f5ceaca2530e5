from ctrl_rl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
