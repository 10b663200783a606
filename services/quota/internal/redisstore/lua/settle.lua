-- settle: correct the buckets a reservation charged by its actual usage, or return
-- everything (release), and delete the reservation.
--
-- K1 the tenant group's hash; K2 the reservation's key of its own, where key-only
-- reservations (redis.go) and earlier versions keep the record.
-- ARGV: now s, now ns, maxdebt, actual tokens, actual input, actual output, release 0|1,
-- the record's field in K1 (prelude.lua: records).
--
-- The record is: expiry "s:ns" | charged mask | budget day or '-' | tokens | budget
-- "cost,input price,output price,day offset" or '-' | buckets
-- "field,kind,cost,limit,shadow" joined by ';' | meta (opaque to this script).
--
-- Returns {0} when the reservation is missing or expired, else {1, s, ns, tokens, cost,
-- spent (-1 without budget), budget reset, meta, buckets, mask, debt of each charged
-- bucket}.
local key = K1
local s, ns = clock(ARGV[1], ARGV[2])
local maxdebt = ARGV[3]
local rfield = ARGV[8]
-- The record, what a settle usually corrects (the tenant's RPM and TPM, whose field
-- names are fieldRPM and fieldTPM in quota.go), and budget day, spending and expiry
-- second, in one read. Other charged buckets (a model's) take a second one.
local v = redis.call('HMGET', key, rfield, 'rpm', 'tpm', 'bd', 'bs', 'x')
local rec = v[1]
local sets, dels = {}, {}
if rec then
  dels[1] = rfield
else
  -- GETDEL (Redis 6.2) is one call where GET and DEL were two; a server without it
  -- gets those two.
  rec = redis.pcall('GETDEL', K2)
  if type(rec) == 'table' and rec.err then
    rec = redis.call('GET', K2)
    if rec then
      redis.call('DEL', K2)
    end
  end
  if not rec then
    return {0}
  end
end
-- One match for the whole record and one per bucket: each a single call into C, where
-- splitting in Lua was a loop of string.find and string.sub per separator.
local es, ens, mask, bday, tokens, budget, buckets, meta =
  string.match(rec, '^(%d+):(%d+)|([01]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
if not es then
  return redis.error_reply('ERR quota: malformed reservation record')
end
es, ens = tonumber(es), tonumber(ens)
if s > es or (s == es and ns >= ens) then
  if dels[1] then
    redis.call('HDEL', key, rfield)
  end
  return {0}
end

local release = ARGV[7] == 1
local actual = ARGV[4]
if release then
  actual = 0
end
local out = {1, s, ns, tonumber(tokens), 0, -1, 0, meta, buckets, mask}

-- The charged buckets (field, kind, cost, limit, value) in charge order.
local specs, more = {}, nil
local i = 0
for field, kind, cost, limit in string.gmatch(buckets, '([^,;]*),(%a),(%-?%d+),(%-?%d+),[01]') do
  i = i + 1
  if string.byte(mask, i) == 49 then -- '1'
    local f = {field, kind, tonumber(cost), tonumber(limit), false}
    if field == 'rpm' then
      f[5] = v[2]
    elseif field == 'tpm' then
      f[5] = v[3]
    else
      more = more or {}
      more[#more + 1] = #specs + 1
    end
    specs[#specs + 1] = f
  end
end
if more then
  local names = {}
  for j, k in ipairs(more) do
    names[j] = specs[k][1]
  end
  local mv = redis.call('HMGET', key, unpack(names))
  for j, k in ipairs(more) do
    specs[k][5] = mv[j]
  end
end
local x = tonumber(v[6] or 0)

local untilS = s
for i, f in ipairs(specs) do
  local cost, limit = f[3], f[4]
  local delta = 0
  if release then
    delta = -cost
  elseif f[2] == 't' then
    delta = actual - cost
  end
  local d = debtOf(f[5], s, ns)
  if delta == 0 then
    -- Unchanged (a request bucket): its stamp stays as it is, only the expiry counts it.
    if d > 0 then
      untilS = math.max(untilS, s + math.ceil(d / E9))
    end
  else
    if delta > 0 then
      d = math.min(d + dur(delta, limit, maxdebt), maxdebt)
    else
      d = math.max(d - dur(-delta, limit, maxdebt), 0)
    end
    local stampV, full = fullAt(s, ns, d)
    if stampV then
      sets[#sets + 1] = f[1]
      sets[#sets + 1] = stampV
    elseif f[5] then
      dels[#dels + 1] = f[1]
    end
    untilS = math.max(untilS, full)
  end
  out[#out + 1] = d
end

if bday ~= '-' then
  local bcost, pin, pout, boff = string.match(budget, '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$')
  bcost, pin, pout = tonumber(bcost), tonumber(pin), tonumber(pout)
  local cost = 0
  if not release then
    local ain, aout = ARGV[5], ARGV[6]
    if ain + aout == 0 then
      cost = actual * math.max(pin, pout)
    else
      cost = ain * pin + aout * pout
    end
  end
  local day, reset = budgetDay(s, ns, tonumber(boff))
  local spent = 0
  if tonumber(v[4] or -1) == day then
    spent = tonumber(v[5])
  end
  -- Spending from an earlier day is history: that day's counter is gone.
  if tonumber(bday) == day then
    spent = math.max(spent + cost - bcost, 0)
    sets[#sets + 1] = 'bd'
    sets[#sets + 1] = string.format('%d', day)
    sets[#sets + 1] = 'bs'
    sets[#sets + 1] = string.format('%d', spent)
  end
  out[5], out[6], out[7] = cost, spent, reset
end
save(key, s, sets, dels, untilS, x)
return out
