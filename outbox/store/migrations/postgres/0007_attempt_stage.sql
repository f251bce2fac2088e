-- How far an attempt got, for channels that go through stages (an SMTP attempt's connect, tls,
-- ehlo, auth, mail, rcpt, data, message, done): what an operator settling an unknown needs.
ALTER TABLE attempts ADD COLUMN stage text;
