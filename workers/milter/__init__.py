"""``streamnb milter``: score mail at SMTP time for Postfix or Sendmail."""
