"""The contract suite's runner, corpus tools, differential mode and Docker launcher.

The suite itself (``suite/``, the checkout's ``contract_tests/``) speaks HTTP only and imports
nothing from here.
"""
