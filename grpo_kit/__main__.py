from grpo_kit.cli import main

main()
