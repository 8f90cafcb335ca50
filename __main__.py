from hbmserve.cluster.cli import main

main()
