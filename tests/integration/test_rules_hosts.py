"""The differential test's episodes of the budget plan across hosts:
arrivals on the other host, and early reads shared fairly between hosts
(their tables, episodes and machinery are test_rules.py's). A file of their
own because each runs a minute of real time, so that `make -j` runs them
beside the rest of the table rather than after it."""

import testenv
from test_rules import ARRIVE, ARRIVE_TABLE, FAIR, FAIR_TABLE, differ


@testenv.timeout(240)
def test_arrivals_on_another_host_alike_in_both_stores(tmpdir):
    # Redis counts every host's arrivals where plan_gather() counts each
    # process's: the second buyer's first read tells them apart
    differ(tmpdir, ARRIVE_TABLE, ARRIVE, budget=4, ids=lambda name: ["%s%d" % (name, i) for i in range(2)],
           together=True)


@testenv.timeout(240)
def test_early_reads_shared_fairly_between_hosts_alike_in_both_stores(tmpdir):
    # Redis shares early reads among every host's buyers where plan_gather()
    # shares them among every process's: the first buyer's second read
    # tells them apart
    differ(tmpdir, FAIR_TABLE, FAIR, budget=4, ids=lambda name: ["%s%d" % (name, i) for i in range(2)],
           together=True)
