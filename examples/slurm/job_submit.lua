-- job_submit.lua for a Slurm cluster whose GPU partitions gpufair schedules through its Slurm
-- bridge: put it next to slurm.conf and set JobSubmitPlugins=lua (checked on Slurm 22.05).
--
-- 1. Every job of those partitions is submitted held (priority 0), so Slurm never starts one by
--    itself: the bridge pins it where gpufair places it, then releases it.
-- 2. A hold by the job's owner is recorded where the bridge sees it. The job is held already
--    (1.), and Slurm ignores a hold of a held job by anyone but an operator: it records nothing.
--    So the owner's `scontrol hold` (or `uhold`) of a pending job also sets the job's begin time
--    to USER_HOLD_BEGIN, which Slurm keeps, the owner may set too, and the bridge reads as "held
--    by its user": it withdraws the job from gpufair and never releases it.
-- 3. Only the owner lifts it. The bridge may have read the job just before the hold and place
--    it in the same cycle: a release by an operator (the bridge's too) leaves the begin time
--    alone, and the bridge's pin (`scontrol update NodeList=...`, an operator's update naming
--    nodes) keeps a begin time the owner set, also when it carries `StartTime=now` (to clear a
--    requeue's delay). Slurm then does not start the job, and the bridge holds it back in its
--    next cycle. Slurm does not show this script a job's begin time, so the script remembers
--    the ones owners set (in memory: a restart of slurmctld, or a change of this file, forgets
--    them; the bridge's pin names no StartTime unless it must, so only a hold landing as the
--    bridge places a requeued job, or one its owner has just released, is then at risk). An
--    operator who hands the job back sets a begin time without nodes (`scontrol update
--    JobId=N StartTime=now`).
-- 4. The owner's release (`scontrol release`) of a held pending job stays a release, so Slurm
--    judges it as without the bridge: refused for a job an operator held (`Access/permission
--    denied`, exit 1), allowed for the bridge's user hold. The script sets the begin time to
--    OWNER_RELEASE_BEGIN with it, so Slurm does not start the released job by itself: the bridge
--    reads it as "handed back", holds the job again, and gpufair places it (the pin's
--    `StartTime=now` clears it).

-- The partitions the bridge maps (its `partitions`), and the uids whose holds and releases are
-- an operator's (root, SlurmUser, the bridge's user).
local GPUFAIR_PARTITIONS = {gpu = true}
local OPERATORS = {[0] = true}
local HOLD_AT_SUBMIT = true
-- 2100-01-01T00:00:00Z: the begin time that means "held by its user" (the bridge's
-- USER_HOLD_BEGIN_S); 2099-12-31T00:00:00Z: "released by its owner" (OWNER_RELEASE_BEGIN_S).
local USER_HOLD_BEGIN = 4102444800
local OWNER_RELEASE_BEGIN = 4102358400
local JOB_PENDING = 0

local function gpufair_partition(partitions)
   for name in string.gmatch(partitions or "", "[^,]+") do
      if GPUFAIR_PARTITIONS[name] then
         return true
      end
   end
   return false
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if HOLD_AT_SUBMIT and gpufair_partition(job_desc.partition) then
      job_desc.priority = 0
   end
   return slurm.SUCCESS
end

-- Job id -> the begin time its owner set (a hold's USER_HOLD_BEGIN, or a later StartTime).
local owner_begin = {}

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   if job_rec.job_state % 256 ~= JOB_PENDING or not gpufair_partition(job_rec.partition) then
      return slurm.SUCCESS
   end
   local id = job_rec.job_id
   local by_owner = modify_uid == job_rec.user_id and not OPERATORS[modify_uid]
   if by_owner then
      if job_desc.priority == 0 then
         job_desc.begin_time = USER_HOLD_BEGIN
      elseif job_desc.priority == slurm.INFINITE and job_rec.priority == 0 then
         job_desc.begin_time = OWNER_RELEASE_BEGIN
      end
      local begin = job_desc.begin_time
      if begin ~= nil and begin ~= 0 then
         if begin > os.time() and begin ~= OWNER_RELEASE_BEGIN then
            owner_begin[id] = begin
         else
            owner_begin[id] = nil
         end
      end
   elseif job_desc.begin_time ~= nil and job_desc.begin_time ~= 0 then
      local kept = owner_begin[id]
      if kept ~= nil and kept > os.time() and job_desc.req_nodes ~= nil then
         job_desc.begin_time = kept
      else
         owner_begin[id] = nil
      end
   end
   return slurm.SUCCESS
end
