"""Run a command under a seccomp filter that refuses some syscalls with EPERM, as a container
runtime's profile does (Docker's default refuses unshare without CAP_SYS_ADMIN, and before Docker
23.0 refused Landlock's syscalls): the sandbox's answers to such a profile are then tested for
real, without a container.

    python -m tests.scripts.under_seccomp SYSCALL[,SYSCALL...] -- COMMAND...
"""

import errno
import os
import sys

import pyseccomp


def main() -> None:
    names, command = sys.argv[1].split(","), sys.argv[sys.argv.index("--") + 1 :]
    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in names:
        rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    rules.load()  # kept across exec, as a runtime's filter is for everything in its container
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
