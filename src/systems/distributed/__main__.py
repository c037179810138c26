from systems.distributed.cli import main

main()
