"""Monte Carlo model of the hot-key problem and its remedies (thesis chapters 3 and 4.4).

zipf.py       key popularity
placement.py  random key -> server assignment (the thesis's model of consistent hashing) and server loads
remedies.py   what to do with the H hottest keys: MBalancer (equal or weighted replicas, G groups), moving them
              without copies, or adding copies of the busiest servers
scenario.py   one setting, many trials: imbalance factor with a 95% confidence interval; the auto-H search
figures.py    the thesis's figures 3.1, 3.2, 3.3 and 4.3 as CSV and PNG
cli.py        `mbalancer simulate ...`
"""
