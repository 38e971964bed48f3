# /etc/dovecot/sieve/learn-spam.sieve: a mail was moved, copied or uploaded into Junk.
# Run by imapsieve (90-streamnb-imapsieve.conf); compile it with `sievec` after each change.
require ["vnd.dovecot.pipe", "copy", "imapsieve", "environment", "variables"];

# The user says: this is spam. :copy leaves the mail where the user put it.
pipe :copy "streamnb-learn" ["spam"];
