"""Print where `make install PREFIX=P` puts the Python package: the
directory of P that this interpreter searches (Debian's python3:
/usr/local/lib/python3.X/dist-packages for /usr/local, and
/usr/lib/python3/dist-packages for /usr), else P's
lib/python3.X/site-packages, which PYTHONPATH can name."""
import os
import sys
import sysconfig

prefix = os.path.normpath(sys.argv[1])
ver = "%d.%d" % sys.version_info[:2]
debian = {"/usr/local": f"/usr/local/lib/python{ver}/dist-packages",
          "/usr": "/usr/lib/python3/dist-packages"}
if prefix in debian and os.path.normpath(debian[prefix]) in map(os.path.normpath, sys.path):
    print(debian[prefix])
else:
    print(sysconfig.get_path("purelib", "posix_prefix", vars={"base": prefix, "platbase": prefix}))
