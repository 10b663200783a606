-- adjust: change a group's buckets outside a reservation: settle the upstream key part
-- of one, undo a charge, or lower buckets to what a provider reported.
--
-- K1 the group's hash.
-- ARGV: now s, now ns, maxdebt, n, then n x (field, mode, a, b, limit). Mode 't' takes a
-- tokens (a negative a returns them); mode 'f' lowers the bucket to hold at most a
-- tokens (-1 leaves it alone) and, when a is 0, to owe at least b ns (bucket.go:
-- observedDebt). 'f' never raises a bucket.
--
-- Returns {s, ns, debt of each bucket afterwards}.
local key = K1
local s, ns = clock(ARGV[1], ARGV[2])
local maxdebt = ARGV[3]
local n = ARGV[4]
local fields = {}
for i = 1, n do
  fields[i] = ARGV[4 + (i - 1) * 5 + 1]
end
fields[n + 1] = 'x'
local v = redis.call('HMGET', key, unpack(fields))
local x = tonumber(v[n + 1] or 0)

local out = {s, ns}
local untilS = s
local sets, dels = {}, {}
for i = 1, n do
  local b = 4 + (i - 1) * 5
  local mode = ARGV[b + 2]
  local a, limit = ARGV[b + 3], ARGV[b + 5]
  local d = debtOf(v[i], s, ns)
  local nd = d
  if mode == 't' then
    if a > 0 then
      nd = math.min(d + dur(a, limit, maxdebt), maxdebt)
    elseif a < 0 then
      nd = math.max(d - dur(-a, limit, maxdebt), 0)
    end
  elseif a >= 0 then
    local target = dur(limit - a, limit, maxdebt)
    if a == 0 then
      target = math.min(math.max(target, ARGV[b + 4]), maxdebt)
    end
    nd = math.max(d, target)
  end
  if nd ~= d then
    local stampV, full = fullAt(s, ns, nd)
    if stampV then
      sets[#sets + 1] = fields[i]
      sets[#sets + 1] = stampV
    elseif v[i] then
      dels[#dels + 1] = fields[i]
    end
    untilS = math.max(untilS, full)
  end
  out[#out + 1] = nd
end
save(key, s, sets, dels, untilS, x)
return out
