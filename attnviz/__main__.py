from attnviz.cli.app import main

main()
