-- The hot path's schema. An update is HOT (no new index entries, the new row version on the same
-- page) only if it changes no column an index names, partial-index predicates included, and its
-- page has room. Per delivery the claim (pending -> leased) and the settle (leased -> its fate)
-- change status, which the claim's index (intents_due), the sweeper's (intents_lease), the
-- listings' (intents_status) and intents_finished/intents_ordering name: those updates cannot be
-- HOT, and the indexes stay because the claim, the sweeper, the console and the listings need
-- each. (The attempt's start no longer writes the intent row at all: two row versions per
-- delivery.)
-- The attempt's finish can be HOT: attempts_finished, the only index naming a column the finish
-- sets, gives way to attempts_started on started_at, which never changes; the console's activity
-- counts the attempts started in its window, by the minute they finished. attempts_in_flight is
-- dropped too: every start put an entry in it, and the one question it answered (an intent's
-- unfinished attempt under its fence) is a seek of attempts_intent among that intent's few
-- attempts. The fill factors leave room on each page for the next version of its rows (an
-- attempt's grows when it finishes, with the reply): an update that is not HOT then still writes
-- its new version to the page it reads, and one that is HOT has room to be. They apply to pages
-- written from now on.
DROP INDEX attempts_in_flight;
DROP INDEX attempts_finished;
CREATE INDEX attempts_started ON attempts (started_at);
ALTER TABLE intents SET (fillfactor = 80);
ALTER TABLE attempts SET (fillfactor = 70);
