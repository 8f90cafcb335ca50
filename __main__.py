from hbmserve.cli.main import main

main()
