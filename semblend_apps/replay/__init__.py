"""``semblend-dynamo replay``: a workload through discovery, the router policy and the connector harness."""
