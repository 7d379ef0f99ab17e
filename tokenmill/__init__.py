"""tokenmill: raw web text to training-ready token shards, and a trainer that streams them."""

__version__ = "0.1.0"

# google-auth and google-api-core (gs:// support, and Beam's GCP modules where installed) warn at
# import about grpcio and Python versions they will require in 2027: notices for their own
# maintainers, not for a tokenmill user, printed on every command's stderr otherwise.
import warnings as _warnings  # noqa: E402

_warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.")
