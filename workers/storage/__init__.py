"""What survives a stop or a crash: clean-stop save/load, worker restart, whole-broker crash, log space, sync policy,
topic journal, nsqd.dat, poison records, leftovers."""
