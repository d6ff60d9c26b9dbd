from grpo_kit.cli.main import main

main()
