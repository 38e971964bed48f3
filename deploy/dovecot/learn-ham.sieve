# /etc/dovecot/sieve/learn-ham.sieve: a mail was moved or copied out of Junk.
# Run by imapsieve (90-streamnb-imapsieve.conf); compile it with `sievec` after each change.
require ["vnd.dovecot.pipe", "copy", "imapsieve", "environment", "variables", "special-use"];

if environment :matches "imap.mailbox" "*" {
  set "mailbox" "${1}";
}

# Into Trash (by name or by its \Trash flag): thrown away, not a verdict. Within Junk: nothing.
if anyof (string :is "${mailbox}" ["Trash", "Junk"],
          specialuse_exists "${mailbox}" ["\\Trash"],
          specialuse_exists "${mailbox}" ["\\Junk"]) {
  stop;
}

# Anywhere else: the user says it is not spam.
pipe :copy "streamnb-learn" ["ham"];
