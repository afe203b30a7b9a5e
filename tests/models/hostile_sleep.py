# Hostile: sleep forever at import.
import time

time.sleep(10**9)
