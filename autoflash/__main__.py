from autoflash.cli import main

main()
