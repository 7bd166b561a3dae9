from coursekit.launch import finish
from coursekit.train import main

if __name__ == "__main__":
    finish(main())  # results reported, process group destroyed: skip the interpreter's slow teardown
