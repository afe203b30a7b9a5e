# Hostile: spin the CPU forever at import.
while True:
    pass
