"""Rank script: fleet.init through the gloo address check, then one all_reduce.

Usage: address_check.py   (any number of ranks, one host or emulated hosts)
Prints the address the check predicts gloo will advertise for this rank, then the sum of
every rank's rank + 1 over the global group (gloo connected every rank to the addresses
they advertised). A refused job ends in fleet.init with AddressCheckError.
"""

import os
import socket
import sys
import time

import paddle
import paddle.distributed as dist
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
import paddle_ext  # noqa: E402
from paddle_ext.comm import address_check  # noqa: E402


def main() -> None:
    paddle_ext.enable()
    predicted = address_check.advertised_address(os.environ.get(address_check.IFNAME_ENV),
                                                 address_check.interfaces(), socket.gethostname(),
                                                 address_check.bindable_addresses)
    start = time.monotonic()
    fleet.init(is_collective=True)
    rank = dist.get_rank()
    print(f"rank {rank}: fleet.init took {time.monotonic() - start:.2f} s; predicted gloo address "
          f"{predicted.address};", flush=True)
    value = paddle.to_tensor([float(rank + 1)])
    dist.all_reduce(value)
    print(f"rank {rank}: all_reduce {float(value.numpy()[0]):g}", flush=True)


if __name__ == "__main__":
    main()
