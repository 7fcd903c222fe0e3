"""mocksandbox: a faithful local SandboxFusion/swedev server and a test-fixture framework."""

__version__ = "0.1.0"
