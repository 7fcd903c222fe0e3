import sys
from pathlib import Path

# The example is a plain script directory, not a package: make `import retry_client` work.
sys.path.insert(0, str(Path(__file__).parent))
