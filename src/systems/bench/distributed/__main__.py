from systems.bench.distributed.cli import main

main()
